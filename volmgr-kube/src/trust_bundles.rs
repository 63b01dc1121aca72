//! ClusterTrustBundles, followed whole (one list and watch of every bundle,
//! as the kubelet's informer does; the node authorizer's `system:node` role
//! allows it): a projected `clusterTrustBundle` source selects bundles by
//! signer and labels, which no per-name watch can follow. The version is
//! the first the API server serves of `v1` (Kubernetes 1.37), `v1beta1`
//! and `v1alpha1` (earlier, when enabled); with none, the kind is listed
//! empty and the sources that need a bundle say it is missing.

use futures_util::StreamExt;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client};
use tokio::sync::mpsc;
use volmgr::populator::objects::{KubeObject, ObjectRef};

use super::backoff::{retries, watch_backoff};
use super::object_update::ObjectUpdate;
use super::transport::watcher_config;

const GROUP: &str = "certificates.k8s.io";
const VERSIONS: [&str; 3] = ["v1", "v1beta1", "v1alpha1"];

/// The bundles' API at the first version the server serves; `None` if it
/// serves none. Retries other errors (the server down) until it answers.
async fn served_api(client: &Client) -> Option<Api<DynamicObject>> {
    let mut backoff = retries();
    loop {
        let mut unanswered = false;
        for version in VERSIONS {
            let gvk = GroupVersionKind::gvk(GROUP, version, "ClusterTrustBundle");
            let resource = ApiResource::from_gvk_with_plural(&gvk, "clustertrustbundles");
            let api = Api::<DynamicObject>::all_with(client.clone(), &resource);
            match api.list(&ListParams::default().limit(1)).await {
                Ok(_) => return Some(api),
                Err(kube::Error::Api(s)) if s.code == 404 => continue,
                Err(e) => {
                    tracing::warn!(version, error = %e, "listing ClusterTrustBundles failed; retrying");
                    unanswered = true;
                    break;
                }
            }
        }
        if !unanswered {
            return None;
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

/// A bundle of any served version, as the `v1` object volmgr reads. The
/// items of a real server's list carry no `apiVersion` nor `kind` (only a
/// watch event's object does): those are the kind's (the versions have the
/// same fields).
fn decode(mut o: DynamicObject) -> Option<KubeObject> {
    if o.types.as_ref().is_none_or(|t| t.kind.is_empty()) {
        o.types = Some(kube::api::TypeMeta {
            api_version: format!("{GROUP}/v1"),
            kind: "ClusterTrustBundle".into(),
        });
    }
    let v = serde_json::to_value(o).ok()?;
    match KubeObject::from_json(v) {
        Ok(obj) => Some(obj),
        Err(e) => {
            tracing::warn!(error = %e, "a ClusterTrustBundle that cannot be read; skipped");
            None
        }
    }
}

/// Lists and watches every ClusterTrustBundle, sending what it finds under
/// `r` (the kind's wildcard) until the task is aborted.
pub(super) async fn follow_all(
    client: Client,
    r: ObjectRef,
    tx: mpsc::Sender<(ObjectRef, ObjectUpdate)>,
) {
    let Some(api) = served_api(&client).await else {
        tracing::info!("the API server serves no ClusterTrustBundles");
        let _ = tx.send((r, ObjectUpdate::Listed(Vec::new()))).await;
        return;
    };
    let mut events = watcher::watcher(api, watcher_config())
        .backoff(watch_backoff())
        .boxed();
    let mut listed: Vec<KubeObject> = Vec::new();
    while let Some(ev) = events.next().await {
        let update = match ev {
            Ok(Event::Init) => {
                listed.clear();
                continue;
            }
            Ok(Event::InitApply(o)) => {
                listed.extend(decode(o));
                continue;
            }
            Ok(Event::InitDone) => ObjectUpdate::Listed(std::mem::take(&mut listed)),
            Ok(Event::Apply(o)) => match decode(o) {
                Some(obj) => ObjectUpdate::Present(obj),
                None => continue,
            },
            Ok(Event::Delete(o)) => match decode(o) {
                Some(obj) => ObjectUpdate::Deleted(obj.reference()),
                None => continue,
            },
            Err(e) => {
                tracing::warn!(error = %e, "ClusterTrustBundle watch failed; retrying");
                continue;
            }
        };
        if tx.send((r.clone(), update)).await.is_err() {
            return;
        }
    }
}
