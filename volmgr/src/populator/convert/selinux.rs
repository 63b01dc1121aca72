//! The SELinux label a volume is mounted with (`-o context=`), as the
//! kubelet's `GetMountSELinuxLabel` (`pkg/volume/util/selinux.go`) and its
//! label translator compute it.
//!
//! - Each container that mounts the volume runs with its own
//!   `securityContext.seLinuxOptions`, or else the pod's (the whole struct:
//!   a container's options replace the pod's).
//! - Its *file* label is go-selinux's `InitLabels` mount label: the
//!   default container file context `system_u:object_r:container_file_t`
//!   with the options' `user` (if set) and `level`. Role and type are the
//!   process's, not the file's, so they are not used.
//! - Every container that mounts the volume must end with the same label,
//!   or the volume is refused ("conflicting SELinux labels").
//! - No level, no label: the runtime would pick a random level that cannot
//!   be known here, and then relabels the files itself.
//! - `seLinuxChangePolicy: Recursive` asks for that relabelling instead of
//!   a mount option.
//!
//! Whether the label is used at all is the CSIDriver's (`seLinuxMount`),
//! the access mode's (ReadWriteOncePod) and the host's (SELinux enabled):
//! see `csi_driver` and the CSI plugin.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Container, Pod, SELinuxOptions};

use super::VolumeSpecError;

/// The default container file context's user (go-selinux, `lxc_contexts`).
const DEFAULT_USER: &str = "system_u";
/// The default container file context's role and type.
const FILE_ROLE_TYPE: &str = "object_r:container_file_t";

/// The label to mount pod volume `volume` with, if it gets one.
pub(super) fn mount_label(pod: &Pod, volume: &str) -> Result<Option<String>, VolumeSpecError> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(None);
    };
    let pod_sc = spec.security_context.as_ref();
    if pod_sc.and_then(|s| s.se_linux_change_policy.as_deref()) == Some("Recursive") {
        return Ok(None);
    }
    let pod_options = pod_sc.and_then(|s| s.se_linux_options.as_ref());
    let containers = spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .filter(|c| mounts(c, volume));
    let labels: BTreeSet<Option<String>> = containers
        .map(|c| {
            let own = c
                .security_context
                .as_ref()
                .and_then(|s| s.se_linux_options.as_ref());
            file_label(own.or(pod_options))
        })
        .collect();
    if labels.len() > 1 {
        let shown: Vec<&str> = labels
            .iter()
            .map(|l| l.as_deref().unwrap_or("<none>"))
            .collect();
        return Err(VolumeSpecError::Invalid(format!(
            "conflicting SELinux labels of volume {volume:?} among the containers that mount it: {}",
            shown.join(", ")
        )));
    }
    Ok(labels.into_iter().next().flatten())
}

/// Whether container `c` mounts pod volume `volume`.
fn mounts(c: &Container, volume: &str) -> bool {
    c.volume_mounts.iter().flatten().any(|m| m.name == volume)
}

/// The file label of a container running with `options`.
fn file_label(options: Option<&SELinuxOptions>) -> Option<String> {
    let o = options?;
    let level = o.level.as_deref().filter(|l| !l.is_empty())?;
    let user = o
        .user
        .as_deref()
        .filter(|u| !u.is_empty())
        .unwrap_or(DEFAULT_USER);
    Some(format!("{user}:{FILE_ROLE_TYPE}:{level}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec})).unwrap()
    }

    fn c(name: &str, volume: &str, options: Option<serde_json::Value>) -> serde_json::Value {
        let mut c = json!({"name": name, "volumeMounts": [{"name": volume, "mountPath": "/d"}]});
        if let Some(o) = options {
            c["securityContext"] = json!({"seLinuxOptions": o});
        }
        c
    }

    #[test]
    fn the_pods_level_gives_the_container_file_label() {
        let p = pod(
            json!({"securityContext": {"seLinuxOptions": {"level": "s0:c1,c2", "type": "spc_t", "role": "r"}},
                           "containers": [c("a", "data", None)]}),
        );
        assert_eq!(
            mount_label(&p, "data").unwrap().as_deref(),
            Some("system_u:object_r:container_file_t:s0:c1,c2")
        );
        // A volume no container mounts, and a pod without options.
        assert_eq!(mount_label(&p, "other").unwrap(), None);
        let p = pod(json!({"containers": [c("a", "data", None)]}));
        assert_eq!(mount_label(&p, "data").unwrap(), None);
    }

    #[test]
    fn a_containers_options_replace_the_pods() {
        let p = pod(
            json!({"securityContext": {"seLinuxOptions": {"level": "s0:c1,c2"}},
                           "containers": [c("a", "data", Some(json!({"user": "u", "level": "s0:c3,c4"})))],
                           "initContainers": [c("i", "data", Some(json!({"user": "u", "level": "s0:c3,c4"})))]}),
        );
        assert_eq!(
            mount_label(&p, "data").unwrap().as_deref(),
            Some("u:object_r:container_file_t:s0:c3,c4")
        );
        // No level in the container's own options: no label, even though
        // the pod has one (the struct is replaced, not merged).
        let p = pod(
            json!({"securityContext": {"seLinuxOptions": {"level": "s0:c1,c2"}},
                           "containers": [c("a", "data", Some(json!({"type": "container_t"})))]}),
        );
        assert_eq!(mount_label(&p, "data").unwrap(), None);
    }

    #[test]
    fn conflicting_labels_are_refused_and_recursive_opts_out() {
        let p = pod(
            json!({"securityContext": {"seLinuxOptions": {"level": "s0:c1,c2"}},
                           "containers": [c("a", "data", None), c("b", "data", Some(json!({"level": "s0:c9"})))]}),
        );
        let e = mount_label(&p, "data").unwrap_err();
        assert!(e.to_string().contains("conflicting SELinux labels"), "{e}");
        assert!(e.to_string().contains("s0:c9"), "{e}");
        let p = pod(
            json!({"securityContext": {"seLinuxOptions": {"level": "s0:c1,c2"},
                                               "seLinuxChangePolicy": "Recursive"},
                           "containers": [c("a", "data", None)]}),
        );
        assert_eq!(mount_label(&p, "data").unwrap(), None);
    }
}
