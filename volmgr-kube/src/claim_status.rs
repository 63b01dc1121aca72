//! A claim's status after its file system was grown on the node, as the
//! kubelet patches it when NodeExpandVolume succeeded
//! (`pkg/volume/util/resize_util.go` `MarkFSResizeFinished`,
//! `MarkNodeExpansionFinishedWithRecovery`): `status.capacity.storage` set
//! to the new size (the PV's capacity), `allocatedResourceStatuses.storage`
//! removed, and the resize conditions (`FileSystemResizePending`,
//! `Resizing`, `ControllerResizeError`, `NodeResizeError`) dropped; with
//! the claim's `resourceVersion`, so a patch of a claim changed meanwhile
//! fails (`409`) and is made again from the claim read anew. Nothing is
//! patched when the claim already says the size and has no resize status
//! (the kubelet's `pvcAlreadyUpdated`: another node grew a shared volume).
//!
//! The manager tells which claims grew
//! ([`VolumeManager::add_claim_resize_listener`]); the listener never
//! blocks (a bounded queue, what does not fit is dropped and logged: the
//! next mount of the volume expands and tells again). One task reads each
//! claim and patches its `status` subresource, retrying failures with
//! backoff. A JSON merge patch (`application/merge-patch+json`), where the
//! kubelet sends a strategic merge patch: `conditions` is then replaced as
//! a whole (the list the kubelet computes), which needs no schema.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, Patch, PatchParams};
use kube::Client;
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};
use volmgr::cache::world::ClaimResize;
use volmgr::util::backoff::Backoff;
use volmgr::volumemanager::VolumeManager;

/// The conditions a finished resize removes (the kubelet's
/// `knownResizeConditions`).
pub const RESIZE_CONDITIONS: [&str; 4] = [
    "FileSystemResizePending",
    "Resizing",
    "ControllerResizeError",
    "NodeResizeError",
];

/// How many claims may wait for their patch.
const QUEUE: usize = 256;

/// Attempts per claim before giving up (the next mount tries again).
const ATTEMPTS: u32 = 8;

/// Why a claim's status could not be patched.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading the claim failed.
    #[error("reading PersistentVolumeClaim {namespace}/{name}: {source}")]
    Get {
        /// The claim's namespace.
        namespace: String,
        /// The claim.
        name: String,
        /// The error.
        #[source]
        source: kube::Error,
    },
    /// Patching its status failed.
    #[error("patching the status of PersistentVolumeClaim {namespace}/{name}: {source}")]
    Patch {
        /// The claim's namespace.
        namespace: String,
        /// The claim.
        name: String,
        /// The error.
        #[source]
        source: kube::Error,
    },
}

/// Registers the listener and starts the task that patches claims, until
/// `shutdown`. Call before the manager starts (the first mounts may grow
/// volumes).
pub fn start(client: Client, vm: &Arc<VolumeManager>, shutdown: watch::Receiver<bool>) {
    let (tx, rx) = mpsc::channel::<ClaimResize>(QUEUE);
    vm.add_claim_resize_listener(Arc::new(move |r: &ClaimResize| {
        if tx.try_send(r.clone()).is_err() {
            tracing::warn!(
                namespace = r.namespace,
                claim = r.claim,
                "claim status patch queue full; the claim keeps its old status.capacity"
            );
        }
    }));
    tokio::spawn(run(client, rx, shutdown));
}

/// Patches the claims received, each retried with backoff.
async fn run(
    client: Client,
    mut rx: mpsc::Receiver<ClaimResize>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let r = tokio::select! {
            () = volmgr::util::shutdown::requested(&mut shutdown) => return,
            r = rx.recv() => match r {
                Some(r) => r,
                None => return,
            },
        };
        let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &r.namespace);
        let mut backoff =
            Backoff::new(Duration::from_millis(500), 2, Duration::from_secs(30)).retries();
        for attempt in 1..=ATTEMPTS {
            match mark_resize_finished(&api, &r).await {
                Ok(()) => break,
                Err(e) if attempt == ATTEMPTS => {
                    tracing::warn!(error = %e, "giving up on the claim's status");
                }
                Err(e) => {
                    tracing::info!(error = %e, attempt, "claim status not patched yet; retrying");
                    tokio::select! {
                        () = volmgr::util::shutdown::requested(&mut shutdown) => return,
                        () = tokio::time::sleep(backoff.next_delay()) => {}
                    }
                }
            }
        }
    }
}

/// Reads the claim and patches its status (if it needs it).
pub async fn mark_resize_finished(
    api: &Api<PersistentVolumeClaim>,
    r: &ClaimResize,
) -> Result<(), Error> {
    let pvc = api.get(&r.claim).await.map_err(|source| Error::Get {
        namespace: r.namespace.clone(),
        name: r.claim.clone(),
        source,
    })?;
    let Some(patch) = resize_finished_patch(&pvc, r.size_bytes) else {
        tracing::debug!(
            namespace = r.namespace,
            claim = r.claim,
            "claim status already up to date"
        );
        return Ok(());
    };
    api.patch_status(&r.claim, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|source| Error::Patch {
            namespace: r.namespace.clone(),
            name: r.claim.clone(),
            source,
        })?;
    tracing::info!(
        namespace = r.namespace,
        claim = r.claim,
        size_bytes = r.size_bytes,
        "claim status.capacity updated after node expansion"
    );
    Ok(())
}

/// The merge patch of `pvc`'s status recording its file system grown to
/// `size` bytes; None when the claim already says so and has no storage
/// resize status.
pub fn resize_finished_patch(pvc: &PersistentVolumeClaim, size: u64) -> Option<Value> {
    let status = pvc.status.clone().unwrap_or_default();
    let have = status
        .capacity
        .as_ref()
        .and_then(|c| c.get("storage"))
        .and_then(|q| volmgr::quantity::parse_bytes(&q.0).ok());
    let statuses = status.allocated_resource_statuses.unwrap_or_default();
    if have.is_some_and(|h| h >= size) && !statuses.contains_key("storage") {
        return None;
    }
    let allocated = match statuses.keys().any(|k| k != "storage") {
        true => json!({ "storage": null }),
        false => Value::Null,
    };
    let kept: Vec<_> = status
        .conditions
        .unwrap_or_default()
        .into_iter()
        .filter(|c| !RESIZE_CONDITIONS.contains(&c.type_.as_str()))
        .collect();
    let conditions = match kept.is_empty() {
        true => Value::Null,
        false => serde_json::to_value(kept).unwrap_or(Value::Null),
    };
    Some(json!({
        "metadata": { "resourceVersion": pvc.metadata.resource_version },
        "status": {
            "capacity": { "storage": quantity(size) },
            "allocatedResourceStatuses": allocated,
            "conditions": conditions,
        },
    }))
}

/// `size` bytes as a quantity: in the largest binary unit that divides it
/// (`640Mi`), else in bytes.
pub fn quantity(size: u64) -> String {
    for (shift, unit) in [(40, "Ti"), (30, "Gi"), (20, "Mi"), (10, "Ki")] {
        if size != 0 && size.is_multiple_of(1u64 << shift) {
            return format!("{}{unit}", size >> shift);
        }
    }
    size.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FakeApiServer;

    const PATH: &str = "/api/v1/namespaces/ns/persistentvolumeclaims/c";

    fn claim() -> Value {
        json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "c", "namespace": "ns"},
            "spec": {"volumeName": "pv", "resources": {"requests": {"storage": "640Mi"}}},
            "status": {
                "phase": "Bound",
                "capacity": {"storage": "320Mi"},
                "allocatedResources": {"storage": "640Mi"},
                "allocatedResourceStatuses": {"storage": "NodeResizePending"},
                "conditions": [
                    {"type": "FileSystemResizePending", "status": "True"},
                    {"type": "ModifyingVolume", "status": "True"}
                ]
            }
        })
    }

    fn resize() -> ClaimResize {
        ClaimResize {
            namespace: "ns".into(),
            claim: "c".into(),
            persistent_volume: Some("pv".into()),
            volume_name: volmgr::volume::UniqueVolumeName::new("kubernetes.io/csi/d^h"),
            size_bytes: 640 << 20,
        }
    }

    #[test]
    fn quantities_in_binary_units() {
        assert_eq!(quantity(640 << 20), "640Mi");
        assert_eq!(quantity(2 << 30), "2Gi");
        assert_eq!(quantity(1000), "1000");
        assert_eq!(quantity(0), "0");
    }

    /// The kubelet's patch: capacity, the storage resize status gone, the
    /// resize conditions gone and the others kept, with the claim's
    /// resourceVersion; as a merge patch of the status subresource.
    #[tokio::test]
    async fn the_status_is_patched_as_the_kubelet_does() {
        let api = FakeApiServer::in_memory();
        api.put_at(PATH, claim());
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(api.client(), "ns");
        mark_resize_finished(&pvcs, &resize()).await.unwrap();
        let reqs = api.take_requests();
        assert_eq!(reqs.len(), 2, "{reqs:?}");
        assert_eq!(
            (reqs[0].method.as_str(), reqs[0].path.as_str()),
            ("GET", PATH)
        );
        let status_path = format!("{PATH}/status");
        assert_eq!(reqs[1].path, status_path);
        assert_eq!(reqs[1].content_type, "application/merge-patch+json");
        assert_eq!(reqs[1].body["metadata"]["resourceVersion"], json!("1"));
        let pvc = api.get_at(PATH).unwrap();
        assert_eq!(pvc["status"]["capacity"]["storage"], json!("640Mi"));
        assert!(
            pvc["status"]["allocatedResourceStatuses"].is_null(),
            "{pvc}"
        );
        assert_eq!(
            pvc["status"]["conditions"],
            json!([{"type": "ModifyingVolume", "status": "True"}])
        );
        assert_eq!(
            pvc["status"]["allocatedResources"]["storage"],
            json!("640Mi")
        );
    }

    /// Already at the size, no resize status: nothing is patched (another
    /// node grew a shared volume); a resize status left is still cleared.
    #[test]
    fn an_updated_claim_is_left_alone() {
        let mut pvc: PersistentVolumeClaim = serde_json::from_value(claim()).unwrap();
        let status = pvc.status.as_mut().unwrap();
        status.capacity.as_mut().unwrap().insert(
            "storage".into(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("640Mi".into()),
        );
        assert!(
            resize_finished_patch(&pvc, 640 << 20).is_some(),
            "the status is cleared"
        );
        pvc.status.as_mut().unwrap().allocated_resource_statuses = None;
        assert!(resize_finished_patch(&pvc, 640 << 20).is_none());
        assert!(resize_finished_patch(&pvc, 1 << 30).is_some());
    }
}
