//! The `subPath` / `subPathExpr` uses of each volume of a pod: per
//! container (containers, init containers, ephemeral containers) and
//! `volumeMount` index, the path inside the volume, as the kubelet's
//! `makeMounts` computes it: `subPathExpr` expanded
//! ([`expansion`](crate::util::expansion)) with the container's
//! environment (`ExpandContainerVolumeMounts`: a reference without a value
//! is an error), then checked (not absolute, no `..`).
//!
//! The environment is what the kubelet can know without other objects: the
//! container's `env` values (expanded with the variables before them) and
//! the downward API `fieldRef`s an env var may use. Variables from
//! ConfigMaps, Secrets, resources or `envFrom` have no value here, so a
//! `subPathExpr` using them is an error of that volume.
//!
//! When they are prepared ([`SubPathTiming`]): the kubelet prepares a
//! container's subPaths when the container starts (`makeMounts`), so an
//! init container may first write the file a later container mounts by
//! subPath. A source says when its pods' containers start:
//! [`sub_path_release`] reads it from the pod's status.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStatus, EnvVar, Pod,
    PodStatus, VolumeMount,
};

use crate::plugins::subpath::{check_sub_path, SubPathError};
use crate::util::expansion::{expand, mapping_for};
use crate::volume::{check_volume_name, PodUid, SubPath, SubPathRelease};

/// When a source's pods get their containers' subPaths bind-mounted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SubPathTiming {
    /// Right after each volume's set-up, for every container (the
    /// manifests directory: no status says when a container starts).
    #[default]
    AtSetUp,
    /// From the pod's status ([`sub_path_release`]): the API source.
    FromStatus,
    /// Only when asked, at container start (`volmgr_prepare_sub_paths`):
    /// the C ABI, whose caller starts the containers.
    OnRequest,
}

impl SubPathTiming {
    /// Whose subPaths are prepared without being asked, for `pod`.
    pub fn release(self, pod: &Pod) -> SubPathRelease {
        match self {
            Self::AtSetUp => SubPathRelease::All,
            Self::FromStatus => sub_path_release(pod),
            Self::OnRequest => SubPathRelease::none(),
        }
    }
}

/// The containers that may start by `pod`'s status, as the kubelet starts
/// them: init container `i` once every init container before it is done,
/// the containers (and ephemeral containers) once all are. Done is
/// terminated with exit code 0, or for a sidecar (an init container with
/// `restartPolicy: Always`) started or running.
pub fn sub_path_release(pod: &Pod) -> SubPathRelease {
    let Some(spec) = pod.spec.as_ref() else {
        return SubPathRelease::All;
    };
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.init_container_statuses.as_deref())
        .unwrap_or_default();
    let mut released = Vec::new();
    for c in spec.init_containers.iter().flatten() {
        released.push(c.name.clone());
        let sidecar = c.restart_policy.as_deref() == Some("Always");
        let done = statuses
            .iter()
            .find(|s| s.name == c.name)
            .is_some_and(|s| init_container_done(s, sidecar));
        if !done {
            return SubPathRelease::Containers(Arc::from(released));
        }
    }
    SubPathRelease::All
}

fn init_container_done(s: &ContainerStatus, sidecar: bool) -> bool {
    let state = s.state.as_ref();
    if sidecar {
        s.started == Some(true) || state.is_some_and(|st| st.running.is_some())
    } else {
        state
            .and_then(|st| st.terminated.as_ref())
            .is_some_and(|t| t.exit_code == 0)
    }
}

/// The part of `pod`'s status [`sub_path_release`] reads, reduced to the
/// init containers that are done (None when none is): a source that skips
/// updates changing nothing a volume depends on keeps this much of the
/// status, so only a container becoming done is an update.
pub fn sub_path_status(pod: &Pod) -> Option<PodStatus> {
    let statuses = pod.status.as_ref()?.init_container_statuses.as_ref()?;
    let inits = pod.spec.as_ref()?.init_containers.as_ref()?;
    let done: Vec<ContainerStatus> = statuses
        .iter()
        .filter_map(|s| {
            let c = inits.iter().find(|c| c.name == s.name)?;
            let sidecar = c.restart_policy.as_deref() == Some("Always");
            init_container_done(s, sidecar).then(|| ContainerStatus {
                name: s.name.clone(),
                started: sidecar.then_some(true),
                state: Some(ContainerState {
                    running: sidecar.then(ContainerStateRunning::default),
                    terminated: (!sidecar).then(ContainerStateTerminated::default),
                    ..ContainerState::default()
                }),
                ..ContainerStatus::default()
            })
        })
        .collect();
    (!done.is_empty()).then(|| PodStatus {
        init_container_statuses: Some(done),
        ..PodStatus::default()
    })
}

/// Per volume name: its uses with a subPath, or why one cannot be used.
pub(super) type SubPathUses = HashMap<String, Result<Vec<SubPath>, SubPathError>>;

/// The subPath uses of every volume of `pod` (whose UID is `uid`).
pub(super) fn sub_paths_of(pod: &Pod, uid: &PodUid) -> SubPathUses {
    let mut uses = SubPathUses::new();
    let Some(spec) = pod.spec.as_ref() else {
        return uses;
    };
    let containers = spec
        .containers
        .iter()
        .map(|c| (&c.name, c.env.as_ref(), c.volume_mounts.as_ref()))
        .chain(
            spec.init_containers
                .iter()
                .flatten()
                .map(|c| (&c.name, c.env.as_ref(), c.volume_mounts.as_ref())),
        )
        .chain(
            spec.ephemeral_containers
                .iter()
                .flatten()
                .map(|c| (&c.name, c.env.as_ref(), c.volume_mounts.as_ref())),
        );
    for (name, env, mounts) in containers {
        let mut env_map: Option<HashMap<String, String>> = None;
        for (index, m) in mounts.into_iter().flatten().enumerate() {
            let expr = m.sub_path_expr.as_deref().unwrap_or("");
            let plain = m.sub_path.as_deref().unwrap_or("");
            if expr.is_empty() && plain.is_empty() {
                continue;
            }
            let env = env_map.get_or_insert_with(|| environment(pod, uid, env));
            let one = sub_path(name, index, m, env);
            let entry = uses.entry(m.name.clone()).or_insert_with(|| Ok(Vec::new()));
            match (entry.as_mut(), one) {
                (Ok(list), Ok(s)) => list.push(s),
                (Ok(_), Err(e)) => *entry = Err(e),
                (Err(_), _) => {}
            }
        }
    }
    uses
}

/// One `volumeMount`'s subPath, expanded and checked.
fn sub_path(
    container: &str,
    index: usize,
    m: &VolumeMount,
    env: &HashMap<String, String>,
) -> Result<SubPath, SubPathError> {
    let fail = |reason: String| SubPathError::Prepare {
        volume: m.name.clone(),
        container: container.to_string(),
        reason,
    };
    check_volume_name(container)
        .map_err(|_| fail(format!("invalid container name {container:?}")))?;
    let expr = m.sub_path_expr.as_deref().unwrap_or("");
    let plain = m.sub_path.as_deref().unwrap_or("");
    let path = match (plain.is_empty(), expr.is_empty()) {
        (false, false) => {
            return Err(fail(
                "subPath and subPathExpr are mutually exclusive".into(),
            ))
        }
        (false, true) => plain.to_string(),
        _ => expand_sub_path_expr(expr, env)
            .map_err(|missing| fail(format!("missing value for {}", missing.join(", "))))?,
    };
    check_sub_path(&path)?;
    Ok(SubPath {
        container: container.to_string(),
        index,
        path,
    })
}

/// `ExpandContainerVolumeMounts`: every `$(NAME)` needs a non-empty value;
/// else the names without one.
fn expand_sub_path_expr(expr: &str, env: &HashMap<String, String>) -> Result<String, Vec<String>> {
    let mut missing = std::collections::BTreeSet::new();
    let out = expand(expr, |name| match env.get(name) {
        Some(v) if !v.is_empty() => v.clone(),
        _ => {
            missing.insert(name.to_string());
            String::new()
        }
    });
    if missing.is_empty() {
        Ok(out)
    } else {
        Err(missing.into_iter().collect())
    }
}

/// A container's environment, as far as it is known here (module doc).
fn environment(pod: &Pod, uid: &PodUid, env: Option<&Vec<EnvVar>>) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for e in env.into_iter().flatten() {
        let value = match &e.value_from {
            None => {
                let before = [&out];
                Some(expand(
                    e.value.as_deref().unwrap_or(""),
                    mapping_for(&before),
                ))
            }
            Some(from) => from
                .field_ref
                .as_ref()
                .and_then(|f| field_value(pod, uid, &f.field_path)),
        };
        match value {
            Some(v) => {
                out.insert(e.name.clone(), v);
            }
            // Unknown here: a later reference to it is "missing".
            None => {
                out.remove(&e.name);
            }
        }
    }
    out
}

/// A downward API field an env var may name (the kubelet's
/// `podFieldSelectorRuntimeValue`), when the pod has it.
fn field_value(pod: &Pod, uid: &PodUid, path: &str) -> Option<String> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    let status = pod.status.as_ref();
    let keyed = |prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|r| r.strip_suffix("']"))
            .map(str::to_string)
    };
    if let Some(k) = keyed("metadata.labels['") {
        return meta.labels.as_ref().and_then(|l| l.get(&k).cloned());
    }
    if let Some(k) = keyed("metadata.annotations['") {
        return meta.annotations.as_ref().and_then(|a| a.get(&k).cloned());
    }
    match path {
        "metadata.name" => meta.name.clone(),
        "metadata.namespace" => Some(meta.namespace.clone().unwrap_or_else(|| "default".into())),
        "metadata.uid" => Some(uid.to_string()),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()),
        "spec.serviceAccountName" => spec.and_then(|s| s.service_account_name.clone()),
        "status.hostIP" => status.and_then(|s| s.host_ip.clone()),
        "status.podIP" => status.and_then(|s| s.pod_ip.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(mounts: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u-1", "labels": {"app": "shop"}},
            "spec": {
                "nodeName": "node-a",
                "containers": [{
                    "name": "c",
                    "env": [
                        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                        {"name": "DIR", "value": "$(APP)-$(POD)"},
                        {"name": "SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
                        {"name": "EMPTY", "value": ""},
                        {"name": "UP", "value": ".."},
                        {"name": "ROOT", "value": "/"}
                    ],
                    "volumeMounts": mounts
                }],
                "initContainers": [{
                    "name": "init",
                    "volumeMounts": [{"name": "other", "mountPath": "/o", "subPath": "x"}]
                }],
                "volumes": [{"name": "data", "emptyDir": {}}, {"name": "other", "emptyDir": {}}]
            }
        }))
        .unwrap()
    }

    fn mounts(last_expr: &str) -> serde_json::Value {
        json!([
            {"name": "data", "mountPath": "/a"},
            {"name": "data", "mountPath": "/b", "subPath": "logs/b"},
            {"name": "data", "mountPath": "/c", "subPathExpr": "$(DIR)/$$x"},
            {"name": "data", "mountPath": "/d", "subPathExpr": last_expr}
        ])
    }

    /// subPath and subPathExpr (env values, fieldRefs, `$$`), per container
    /// and index; a reference without a value is that volume's error.
    #[test]
    fn sub_paths_per_container_and_index() {
        let uid = PodUid::new("u-1").unwrap();
        let uses = sub_paths_of(&pod(mounts("$(DIR)/$(POD)")), &uid);
        let paths: Vec<_> = uses["data"]
            .as_ref()
            .unwrap()
            .iter()
            .map(|s| (s.container.as_str(), s.index, s.path.as_str()))
            .collect();
        assert_eq!(
            paths,
            [
                ("c", 1, "logs/b"),
                ("c", 2, "shop-web/$x"),
                ("c", 3, "shop-web/web")
            ]
        );
        assert_eq!(
            uses["other"].as_ref().unwrap(),
            &vec![SubPath {
                container: "init".into(),
                index: 0,
                path: "x".into()
            }]
        );
        // Unset, from a Secret (unknown here), or empty: missing.
        for var in ["UNSET", "SECRET", "EMPTY"] {
            let uses = sub_paths_of(&pod(mounts(&format!("a/$({var})"))), &uid);
            let err = uses["data"].as_ref().unwrap_err().to_string();
            assert!(err.contains(&format!("missing value for {var}")), "{err}");
            assert!(
                err.contains("volumeMount \"data\" of container \"c\""),
                "{err}"
            );
            assert!(uses["other"].is_ok(), "another volume is not affected");
        }
    }

    fn staged(statuses: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "uid": "u"},
            "spec": {
                "initContainers": [
                    {"name": "a", "image": "i"},
                    {"name": "side", "image": "i", "restartPolicy": "Always"},
                    {"name": "b", "image": "i"}
                ],
                "containers": [{"name": "app", "image": "i"}]
            },
            "status": {"phase": "Pending", "initContainerStatuses": statuses}
        }))
        .unwrap()
    }

    fn st(name: &str, state: serde_json::Value) -> serde_json::Value {
        json!({"name": name, "image": "i", "imageID": "", "ready": false,
               "restartCount": 0, "state": state})
    }

    /// As the kubelet starts containers: each init container once those
    /// before it are done (exit code 0; a sidecar started), the rest once
    /// all are; the reduced status keeps exactly what decides it.
    #[test]
    fn containers_are_released_as_init_containers_finish() {
        let names = |r: SubPathRelease| match r {
            SubPathRelease::All => vec!["*".to_string()],
            SubPathRelease::Containers(c) => c.to_vec(),
        };
        let ok = json!({"terminated": {"exitCode": 0}});
        let failed = json!({"terminated": {"exitCode": 1}});
        let running = json!({"running": {}});
        for (statuses, want) in [
            (json!([]), vec!["a"]),
            (json!([st("a", running.clone())]), vec!["a"]),
            (json!([st("a", failed)]), vec!["a"]),
            (json!([st("a", ok.clone())]), vec!["a", "side"]),
            (
                json!([st("a", ok.clone()), st("side", running.clone())]),
                vec!["a", "side", "b"],
            ),
            (
                json!([
                    st("a", ok.clone()),
                    st("side", running.clone()),
                    st("b", ok.clone())
                ]),
                vec!["*"],
            ),
        ] {
            let pod = staged(statuses.clone());
            assert_eq!(names(sub_path_release(&pod)), want, "{statuses}");
            // The reduced status decides the same.
            let mut reduced = pod.clone();
            reduced.status = sub_path_status(&pod);
            assert_eq!(names(sub_path_release(&reduced)), want, "{statuses}");
        }
        // A pod without init containers: everyone's at once.
        let plain: Pod = serde_json::from_value(
            json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}),
        )
        .unwrap();
        assert_eq!(sub_path_release(&plain), SubPathRelease::All);
        // Only a container becoming done changes the reduced status.
        let waiting = staged(json!([st(
            "a",
            json!({"waiting": {"reason": "PodInitializing"}})
        )]));
        let started = staged(json!([st("a", running)]));
        assert_eq!(sub_path_status(&waiting), None);
        assert_eq!(sub_path_status(&waiting), sub_path_status(&started));
        assert_ne!(
            sub_path_status(&started),
            sub_path_status(&staged(json!([st("a", ok)])))
        );
        assert_eq!(
            SubPathTiming::OnRequest.release(&plain),
            SubPathRelease::none()
        );
    }

    /// The kubelet's checks: absolute, `..` (also after expansion), both
    /// fields set.
    #[test]
    fn bad_sub_paths_are_volume_errors() {
        let uid = PodUid::new("u-1").unwrap();
        for (mount, want) in [
            (json!({"subPath": "/etc"}), "must not be an absolute path"),
            (json!({"subPath": "a/../../b"}), "must not contain '..'"),
            (json!({"subPath": ".."}), "must not contain '..'"),
            (json!({"subPathExpr": "$(UP)/x"}), "must not contain '..'"),
            (
                json!({"subPathExpr": "$(ROOT)etc"}),
                "must not be an absolute path",
            ),
            (
                json!({"subPath": "a", "subPathExpr": "b"}),
                "mutually exclusive",
            ),
        ] {
            let mut m = json!({"name": "data", "mountPath": "/m"});
            for (k, v) in mount.as_object().unwrap() {
                m[k] = v.clone();
            }
            let err = sub_paths_of(&pod(json!([m])), &uid)["data"]
                .as_ref()
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{mount}: {err}");
        }
    }
}
