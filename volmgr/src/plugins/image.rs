//! `image` volumes (KEP-4639): an OCI image or artifact that the container
//! runtime pulls and mounts into the containers itself. As the kubelet's
//! `kubernetes.io/image` plugin, this one is a stub: set-up and tear-down do
//! nothing and the volume has no path (the kubelet's `GetPath` is `""`).
//!
//! Nothing is kept on disk, so nothing is reconstructed at start-up: after a
//! restart the volume is simply set up again, which costs nothing, and shows
//! `mounted` as soon as its pod is read.

use std::path::{Path, PathBuf};

use crate::sys::mount_table::MountTableView;
use crate::volume::{VolumeSource, VolumeSpec};

use super::{MountRequest, UnmountRequest, VolumeError, VolumePlugin};

/// The plugin's name (the kubelet's).
pub const PLUGIN_NAME: &str = "kubernetes.io/image";

/// The image volume plugin.
#[derive(Debug, Default)]
pub struct ImagePlugin;

#[async_trait::async_trait]
impl VolumePlugin for ImagePlugin {
    fn name(&self) -> &str {
        PLUGIN_NAME
    }

    fn can_support(&self, source: &VolumeSource) -> bool {
        matches!(source, VolumeSource::Image { .. })
    }

    /// Nothing to do: the container runtime mounts the image. The path is
    /// empty, as the kubelet's.
    async fn set_up(&self, req: MountRequest) -> Result<PathBuf, VolumeError> {
        match &req.spec.source {
            VolumeSource::Image { .. } => Ok(PathBuf::new()),
            _ => Err(VolumeError::InvalidSpec("not an image volume".into())),
        }
    }

    async fn tear_down(&self, _req: UnmountRequest) -> Result<(), VolumeError> {
        Ok(())
    }

    fn runs_inline(&self, _spec: &VolumeSpec) -> bool {
        true
    }

    fn verify_reads_mount_table(&self, _spec: &VolumeSpec) -> bool {
        false
    }

    fn verify(&self, _spec: &VolumeSpec, _path: &Path, _table: MountTableView<'_>) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::sys::mount_table::MountTable;
    use crate::volume::{PodUid, UniqueVolumeName};

    fn spec() -> Arc<VolumeSpec> {
        Arc::new(VolumeSpec {
            name: "img".into(),
            source: VolumeSource::Image {
                reference: "quay.io/crio/artifact:v1".into(),
                pull_policy: Some("IfNotPresent".into()),
            },
        })
    }

    #[tokio::test]
    async fn set_up_and_tear_down_do_nothing() {
        let p = ImagePlugin;
        let pod = PodUid::new("pod1").unwrap();
        assert!(p.can_support(&spec().source));
        let name = p.unique_volume_name(&pod, &spec());
        assert_eq!(name, UniqueVolumeName::new("kubernetes.io/image/pod1-img"));
        let req = MountRequest {
            pod_uid: pod.clone(),
            volume_name: name.clone(),
            spec: spec(),
            fs_group: Some(5),
            fs_group_change_policy: Default::default(),
            selinux_label: None,
        };
        assert_eq!(p.set_up(req.clone()).await.unwrap(), PathBuf::new());
        assert_eq!(p.set_up(req).await.unwrap(), PathBuf::new());
        let table = MountTable::new(Vec::new());
        assert!(p.verify(&spec(), Path::new(""), MountTableView::Read(&table)));
        assert!(!crate::plugins::foreign::is_foreign(
            &p,
            &spec(),
            Path::new(""),
            &table
        ));
        p.tear_down(UnmountRequest {
            pod_uid: pod.clone(),
            volume_name: name,
            spec: spec(),
            path: PathBuf::new(),
        })
        .await
        .unwrap();
        // Nothing on disk: nothing to reconstruct.
        assert!(p.volumes_dir_name().is_none());
        assert!(p.reconstruct(&pod, "img", &table).unwrap().is_none());
        let other = VolumeSource::EmptyDir {
            medium: crate::volume::StorageMedium::Default,
            size_limit: None,
        };
        assert!(!p.can_support(&other));
    }
}
