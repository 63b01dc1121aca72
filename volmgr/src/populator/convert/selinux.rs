//! What a pod says about the SELinux label of each volume it uses (the
//! inputs of the kubelet's `getSELinuxLabel`, see `cache::selinux`): the
//! kubelet's `GetPodVolumeNames` (`pkg/volume/util/util.go`) collecting the
//! effective `seLinuxOptions` of each container that mounts the volume, and
//! its label translator (`pkg/volume/util/selinux.go`) turning them into
//! file labels.
//!
//! - Each container (init, regular and ephemeral) that mounts the volume
//!   runs with its own `securityContext.seLinuxOptions`, or else the pod's
//!   (`DetermineEffectiveSecurityContext`: the whole struct, a container's
//!   options replace the pod's). A container with neither adds nothing.
//! - Its *file* label is go-selinux's `InitLabels` mount label: the default
//!   container file context `system_u:object_r:container_file_t` with the
//!   options' `user` (if set) and `level`. Role and type are the process's,
//!   not the file's, so they are not used.
//! - Options without a level: go-selinux gives each a random level, which
//!   the container runtime does not share (it picks its own). Two such
//!   containers, or one next to a container with a level, conflict, as
//!   with the kubelet; a single one gives no label here (the kubelet would
//!   mount with a random level no container can use).
//! - The PersistentVolume's access modes, for the access-mode rule and the
//!   metrics (`None`: an inline volume).

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod, SELinuxOptions};

use crate::cache::selinux::VolumeSeLinux;
use crate::populator::objects::ObjectStore;

/// The default container file context's user (go-selinux, `lxc_contexts`).
const DEFAULT_USER: &str = "system_u";
/// The default container file context's role and type.
const FILE_ROLE_TYPE: &str = "object_r:container_file_t";

/// What pod `pod` says about the label of its volume `volume`; `objects`
/// give the PersistentVolume of a claim.
pub(super) fn volume_selinux(
    pod: &Pod,
    volume: &k8s_openapi::api::core::v1::Volume,
    namespace: &str,
    objects: Option<&ObjectStore>,
) -> VolumeSeLinux {
    let mut out = VolumeSeLinux::default();
    let Some(spec) = pod.spec.as_ref() else {
        return out;
    };
    let pod_sc = spec.security_context.as_ref();
    out.recursive = pod_sc.and_then(|s| s.se_linux_change_policy.as_deref()) == Some("Recursive");
    let pod_options = pod_sc.and_then(|s| s.se_linux_options.as_ref());
    let name = volume.name.as_str();
    let mounts = |m: &Option<Vec<k8s_openapi::api::core::v1::VolumeMount>>| {
        m.iter().flatten().any(|m| m.name == name)
    };
    let containers = spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .filter(|c| mounts(&c.volume_mounts))
        .map(|c| own(c.security_context.as_ref()));
    let ephemeral = spec
        .ephemeral_containers
        .iter()
        .flatten()
        .filter(|c| mounts(&c.volume_mounts))
        .map(|c| own(c.security_context.as_ref()));
    let mut labels = BTreeSet::new();
    for options in containers
        .chain(ephemeral)
        .filter_map(|o| o.or(pod_options))
    {
        match file_label(options) {
            Some(l) => {
                labels.insert(Arc::<str>::from(l));
            }
            None => out.random_levels += 1,
        }
    }
    out.file_labels = labels;
    out.pv_access_modes = objects.and_then(|o| pv_access_modes(pod, volume, namespace, o));
    out
}

/// Longest field of an SELinux context volmgr accepts (the kernel's
/// contexts are short; this bounds what goes into mount options).
const MAX_FIELD: usize = 255;

/// A field of a pod's `seLinuxOptions` that cannot be part of an SELinux
/// context: it would reach the `context="..."` mount option of the pod's
/// volumes, where a `"` or `,` could end the option and add others.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{at}.seLinuxOptions.{field}: {value:?} is not an SELinux context field (letters, digits and `_.:,-` only, at most 255 bytes)")]
pub struct SeLinuxOptionsError {
    /// `spec.securityContext` or `spec.containers[NAME].securityContext`.
    pub at: String,
    /// `user`, `role`, `type` or `level`.
    pub field: &'static str,
    /// The value, cut to [`MAX_FIELD`] bytes at most.
    pub value: String,
}

/// Checks every `seLinuxOptions` of `pod` (the pod's and each container's,
/// init and ephemeral ones included): each field made of the characters
/// SELinux users, roles, types and MLS/MCS levels are made of (`s0-s0:c0.c1023`,
/// `system_u`, `container_t`) and at most [`MAX_FIELD`] bytes.
pub(super) fn check_options(pod: &Pod) -> Result<(), SeLinuxOptionsError> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(());
    };
    let pod_level = spec
        .security_context
        .as_ref()
        .and_then(|s| s.se_linux_options.as_ref())
        .map(|o| ("spec.securityContext".to_string(), o));
    let containers = spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .filter_map(|c| own(c.security_context.as_ref()).map(|o| (c.name.as_str(), o)));
    let ephemeral = spec
        .ephemeral_containers
        .iter()
        .flatten()
        .filter_map(|c| own(c.security_context.as_ref()).map(|o| (c.name.as_str(), o)));
    let named = containers
        .chain(ephemeral)
        .map(|(n, o)| (format!("spec.containers[{n:?}].securityContext"), o));
    for (at, o) in pod_level.into_iter().chain(named) {
        let fields = [
            ("user", &o.user),
            ("role", &o.role),
            ("type", &o.type_),
            ("level", &o.level),
        ];
        for (field, value) in fields {
            let Some(v) = value.as_deref() else { continue };
            let ok = v.len() <= MAX_FIELD
                && v.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.:,-".contains(&b));
            if !ok {
                let cut = v.char_indices().take_while(|(i, _)| *i < MAX_FIELD).count();
                return Err(SeLinuxOptionsError {
                    at,
                    field,
                    value: v.chars().take(cut).collect(),
                });
            }
        }
    }
    Ok(())
}

/// A container's own `seLinuxOptions`.
fn own(sc: Option<&k8s_openapi::api::core::v1::SecurityContext>) -> Option<&SELinuxOptions> {
    sc.and_then(|s| s.se_linux_options.as_ref())
}

/// The file label of a container running with `options`; `None` when they
/// have no level.
fn file_label(o: &SELinuxOptions) -> Option<String> {
    let level = o.level.as_deref().filter(|l| !l.is_empty())?;
    let user = o
        .user
        .as_deref()
        .filter(|u| !u.is_empty())
        .unwrap_or(DEFAULT_USER);
    Some(format!("{user}:{FILE_ROLE_TYPE}:{level}"))
}

/// The access modes of the PersistentVolume bound to the claim of
/// `volume` (a `persistentVolumeClaim`, or a generic ephemeral volume's
/// `<pod>-<volume>` claim), when `objects` know both.
fn pv_access_modes(
    pod: &Pod,
    volume: &k8s_openapi::api::core::v1::Volume,
    namespace: &str,
    objects: &ObjectStore,
) -> Option<Vec<String>> {
    let claim = match (&volume.persistent_volume_claim, &volume.ephemeral) {
        (Some(c), _) => c.claim_name.clone(),
        (None, Some(_)) => format!(
            "{}-{}",
            pod.metadata.name.as_deref().unwrap_or(""),
            volume.name
        ),
        (None, None) => return None,
    };
    let pvc = objects.get::<PersistentVolumeClaim>(namespace, &claim)?;
    let bound = pvc
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .filter(|n| !n.is_empty());
    let pv = match bound {
        Some(name) => objects.get::<PersistentVolume>("", name)?,
        None => objects.persistent_volume_for_claim(namespace, &claim)?,
    };
    Some(
        pv.spec
            .as_ref()
            .and_then(|s| s.access_modes.clone())
            .unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec})).unwrap()
    }

    /// A level that would close the `context="..."` mount option and add
    /// others (`nosuid` off, say) is refused, naming where; the contexts
    /// SELinux hosts use pass. Before, it went into the CSI mount flags
    /// as it was.
    #[test]
    fn options_that_would_escape_the_mount_option_are_refused() {
        for level in ["s0:c1,c2", "s0-s0:c0.c1023", "s0"] {
            let p = pod(
                json!({"securityContext": {"seLinuxOptions": {"level": level, "user": "system_u"}},
                "containers": [c("a", "v", None)]}),
            );
            assert_eq!(check_options(&p), Ok(()), "{level}");
        }
        let p =
            pod(json!({"containers": [c("a", "v", Some(json!({"level": "s0\",dev,suid,x=\""})))]}));
        let e = check_options(&p).unwrap_err();
        assert_eq!(e.at, "spec.containers[\"a\"].securityContext");
        assert_eq!(e.field, "level");
        assert!(
            e.to_string().contains("is not an SELinux context field"),
            "{e}"
        );
        let long = "s".repeat(300);
        let p = pod(
            json!({"securityContext": {"seLinuxOptions": {"type": long}},
            "containers": [c("a", "v", None)]}),
        );
        let e = check_options(&p).unwrap_err();
        assert_eq!((e.field, e.value.len()), ("type", 255));
        // And the pod is rejected as a whole, with that reason.
        let mut p = pod(
            json!({"containers": [c("a", "v", Some(json!({"user": "u u"})))],
            "volumes": [{"name": "v", "emptyDir": {}}]}),
        );
        p.metadata.uid = Some("00000000-0000-0000-0000-0000000000dd".into());
        let r = crate::populator::convert::pod::DesiredPod::from_pod(&p).unwrap_err();
        assert!(r.reason.contains("seLinuxOptions.user"), "{}", r.reason);
    }

    fn c(name: &str, volume: &str, options: Option<serde_json::Value>) -> serde_json::Value {
        let mut c = json!({"name": name, "volumeMounts": [{"name": volume, "mountPath": "/d"}]});
        if let Some(o) = options {
            c["securityContext"] = json!({"seLinuxOptions": o});
        }
        c
    }

    fn facts(p: &Pod, volume: &str) -> VolumeSeLinux {
        let v = k8s_openapi::api::core::v1::Volume {
            name: volume.into(),
            ..Default::default()
        };
        volume_selinux(p, &v, "default", None)
    }

    fn labels(f: &VolumeSeLinux) -> Vec<&str> {
        f.file_labels.iter().map(|l| &**l).collect()
    }

    /// `Test_AddPodToVolume_SELinuxSinglePod`'s translations (its fake
    /// translator fills the same defaults as go-selinux for these): the
    /// complete options and the level-only ones give
    /// `system_u:object_r:container_file_t:s0:c1,c2`; no options, no label.
    #[test]
    fn the_pods_level_gives_the_container_file_label() {
        for options in [
            json!({"user": "system_u", "role": "object_r", "type": "container_t", "level": "s0:c1,c2"}),
            json!({"level": "s0:c1,c2"}),
            json!({"level": "s0:c1,c2", "type": "spc_t", "role": "r"}),
        ] {
            let p = pod(json!({"securityContext": {"seLinuxOptions": options},
                               "containers": [c("a", "data", None)]}));
            assert_eq!(
                labels(&facts(&p, "data")),
                ["system_u:object_r:container_file_t:s0:c1,c2"]
            );
            // A volume no container mounts.
            assert_eq!(facts(&p, "other"), VolumeSeLinux::default());
        }
        let p = pod(json!({"containers": [c("a", "data", None)]}));
        assert_eq!(facts(&p, "data"), VolumeSeLinux::default());
    }

    /// `DetermineEffectiveSecurityContext`: a container's options replace
    /// the pod's whole; init and ephemeral containers count.
    #[test]
    fn a_containers_options_replace_the_pods() {
        let p = pod(
            json!({"securityContext": {"seLinuxOptions": {"level": "s0:c1,c2"}},
                           "containers": [c("a", "data", Some(json!({"user": "u", "level": "s0:c3,c4"})))],
                           "initContainers": [c("i", "data", Some(json!({"user": "u", "level": "s0:c3,c4"})))]}),
        );
        assert_eq!(
            labels(&facts(&p, "data")),
            ["u:object_r:container_file_t:s0:c3,c4"]
        );
        // No level in the container's own options: a random one, not the
        // pod's (the struct is replaced, not merged).
        let p = pod(
            json!({"securityContext": {"seLinuxOptions": {"level": "s0:c1,c2"}},
                           "containers": [c("a", "data", Some(json!({"type": "container_t"})))]}),
        );
        let f = facts(&p, "data");
        assert!(f.file_labels.is_empty());
        assert_eq!(f.random_levels, 1);
        let p = pod(json!({"containers": [c("a", "data", None)],
                           "ephemeralContainers": [c("e", "data", Some(json!({"level": "s0:c9"})))]}));
        assert_eq!(
            labels(&facts(&p, "data")),
            ["system_u:object_r:container_file_t:s0:c9"]
        );
    }

    /// Containers that disagree give both labels (the kubelet's
    /// `MultipleSELinuxLabelsError`, decided in `cache::selinux`); a
    /// container without options adds none; the Recursive policy is kept.
    #[test]
    fn containers_that_disagree_give_every_label() {
        let p = pod(
            json!({"securityContext": {"seLinuxOptions": {"level": "s0:c1,c2"},
                                               "seLinuxChangePolicy": "Recursive"},
                           "containers": [c("a", "data", None), c("b", "data", Some(json!({"level": "s0:c9"})))]}),
        );
        let f = facts(&p, "data");
        assert_eq!(
            labels(&f),
            [
                "system_u:object_r:container_file_t:s0:c1,c2",
                "system_u:object_r:container_file_t:s0:c9"
            ]
        );
        assert!(f.recursive);
    }
}
