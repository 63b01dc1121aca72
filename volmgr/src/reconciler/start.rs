//! Starting what a pass decided: each [`Action`] handed with its operation
//! body (from the generator) to the executor.

use std::future::Future;
use std::sync::Arc;

use super::action::Action;
use super::{boxed, BoxedOperation, Reconciler};
use crate::metrics::PluginLabel;
use crate::operationexecutor::generator::{self, ForeignMountRemoval, SubPathMounts};
use crate::operationexecutor::{NotStarted, OperationKind};
use crate::plugins::{VolumeError, VolumePlugin};
use crate::volume::{PodUid, SubPath, UniqueVolumeName};

impl Reconciler {
    /// Starts `action`: spawned as its own task, or, for the tear-down of a
    /// volume whose plugin runs it inline, added to `tear_downs` (see
    /// [`run_batch`]).
    pub(super) fn start(self: &Arc<Self>, action: Action, tear_downs: &mut Vec<BoxedOperation>) {
        let (volume, pod, plugin_name, _) = action.key();
        let (volume, pod, plugin_name) = (volume.clone(), pod.cloned(), Arc::clone(plugin_name));
        let Some(plugin) = self.plugins.find_by_name(&plugin_name) else {
            tracing::warn!(%volume, plugin = %plugin_name, "volume plugin is not registered");
            return;
        };
        // The metrics label: the plugin name, or a finer one (CSI driver).
        let label = action
            .spec()
            .and_then(|s| plugin.metric_label(s))
            .unwrap_or_else(|| Arc::clone(&plugin_name).into());
        let batched = matches!(
            &action,
            Action::Unmount { mounted, .. } if plugin.runs_inline(&mounted.spec)
        );
        let prepared = self.prepare_action(action, plugin, plugin_name, label);
        match prepared {
            Ok(op) if batched => tear_downs.push(op),
            Ok(op) => {
                tokio::spawn(op);
            }
            Err(why) => tracing::debug!(%volume, pod = ?pod, ?why, "operation not started"),
        }
    }

    /// Hands `action`'s operation body (from the generator) to the executor.
    pub(super) fn prepare_action(
        &self,
        action: Action,
        plugin: Arc<dyn VolumePlugin>,
        plugin_name: Arc<str>,
        label: PluginLabel,
    ) -> Result<BoxedOperation, NotStarted> {
        let (volume, pod, _, kind) = action.key();
        let (volume, pod) = (volume.clone(), pod.cloned());
        let (pod, world) = (pod.as_ref(), Arc::clone(&self.world));
        match action {
            Action::RemoveForeignMounts {
                pod: upod,
                mounted,
                found,
                ..
            } => {
                let op = ForeignMountRemoval {
                    world,
                    log: Arc::clone(&self.out_of_band),
                    root: Arc::clone(&self.root),
                    mounter: Arc::clone(&self.mounter),
                    plugin,
                    volume: volume.clone(),
                    pod: upod,
                    mounted,
                    found,
                };
                let body = generator::remove_foreign_mounts(op);
                self.prepare(&volume, pod, kind, label, body)
            }
            Action::Mount { req, sub_paths, .. } => {
                let subs = self.sub_path_mounts(sub_paths);
                let body = generator::mount_volume(world, plugin, plugin_name, req, subs);
                self.prepare(&volume, pod, kind, label, body)
            }
            Action::PrepareSubPaths {
                pod: upod,
                mounted,
                sub_paths,
                ..
            } => {
                let subs = self.sub_path_mounts(sub_paths);
                let body = generator::prepare_sub_paths(world, volume.clone(), upod, mounted, subs);
                self.prepare(&volume, pod, kind, label, body)
            }
            Action::Unmount {
                mounted, pod: upod, ..
            } => {
                let subs = self.sub_path_mounts(Vec::new());
                let body =
                    generator::unmount_volume(world, plugin, volume.clone(), upod, mounted, subs);
                self.prepare(&volume, pod, kind, label, body)
            }
            Action::MountDevice { spec, fs_group, .. } => {
                let body = generator::mount_device(
                    world,
                    plugin,
                    plugin_name,
                    volume.clone(),
                    spec,
                    fs_group,
                );
                self.prepare(&volume, None, kind, label, body)
            }
            Action::UnmountDevice { .. } => {
                let body = generator::unmount_device(world, plugin, volume.clone());
                self.prepare(&volume, None, kind, label, body)
            }
            Action::Expand { spec, new_size, .. } => {
                let body = generator::expand_volume(world, plugin, volume.clone(), spec, new_size);
                self.prepare(&volume, None, kind, label, body)
            }
        }
    }

    /// What a mount or unmount needs for `subs`, the subPath bind mounts.
    pub(super) fn sub_path_mounts(&self, subs: Vec<SubPath>) -> SubPathMounts {
        SubPathMounts {
            root: Arc::clone(&self.root),
            mounter: Arc::clone(&self.mounter),
            subs,
        }
    }

    /// [`OperationExecutor::prepare`], boxed.
    pub(super) fn prepare<F>(
        &self,
        volume: &UniqueVolumeName,
        pod: Option<&PodUid>,
        kind: OperationKind,
        label: PluginLabel,
        op: F,
    ) -> Result<BoxedOperation, NotStarted>
    where
        F: Future<Output = Result<(), VolumeError>> + Send + 'static,
    {
        self.executor
            .prepare(volume, pod, kind, label, op)
            .map(boxed)
    }
}
