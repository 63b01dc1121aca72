//! A `hostPath` source, inline in a pod or a hostPath PersistentVolume's
//! `spec.hostPath`: the one check of its path and type for both.

use std::path::PathBuf;

use super::{invalid, VolumeSpecError};
use crate::volume::{HostPathType, VolumeSource};

/// `hostPath`: an absolute, clean path and a known type (an inline volume,
/// or a hostPath PersistentVolume's `spec.hostPath`).
pub(super) fn host_path_source(
    hp: &k8s_openapi::api::core::v1::HostPathVolumeSource,
) -> Result<VolumeSource, VolumeSpecError> {
    let path = PathBuf::from(&hp.path);
    if !path.is_absolute() {
        return Err(invalid(format!(
            "hostPath path {:?} must be absolute",
            hp.path
        )));
    }
    if hp.path.contains('\0') {
        return Err(invalid("hostPath path must not contain NUL"));
    }
    if path
        .components()
        .any(|c| c == std::path::Component::ParentDir)
    {
        return Err(invalid(format!(
            "hostPath path {:?} must not contain '..'",
            hp.path
        )));
    }
    let t = hp.type_.as_deref().unwrap_or("");
    let kind =
        HostPathType::parse(t).ok_or_else(|| invalid(format!("unknown hostPath type {t:?}")))?;
    Ok(VolumeSource::HostPath { path, kind })
}
