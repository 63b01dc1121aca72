//! Reading one object a pod needs by `get`, as the kubelet does for the
//! kinds the Node authorizer lets a node only `get` (never list or watch):
//! PersistentVolumeClaims, PersistentVolumes, VolumeAttachments and
//! ServiceAccounts of the node's pods. The object is read again on a
//! schedule, as the kubelet reads a pod's claim again at each pod sync:
//! soon after a change or while it is missing (a claim about to be bound,
//! an attachment about to be made), about once a minute once it is stable,
//! each wait jittered. Once its pod is terminating, nothing of it is read
//! again (`PodResolver::stop_reading`). A refused or failed read backs off ([`super::backoff::retries`]); its cause shows in
//! status and the log once ([`ApiProblems`]).

use std::sync::Arc;
use std::time::Duration;

use kube::Api;
use tokio::sync::mpsc;

use volmgr::populator::objects::{Kind, KubeObject, ObjectKind, ObjectRef};
use volmgr::util::backoff::random_fraction;

use super::object_update::{cause, ObjectUpdate};
use super::problems::ApiProblems;

/// The first re-read after a change, or of a missing object.
const SOON: Duration = Duration::from_secs(1);
/// The re-read period of a missing object, or of one not ready yet (a
/// claim not bound, an attachment not attached), at most.
const MISSING_MAX: Duration = Duration::from_secs(10);
/// The re-read period of an object that does not change, at most (the
/// kubelet's pod sync period).
const STABLE_MAX: Duration = Duration::from_secs(60);

/// Whether the node reads objects of `kind` by `get` only (see the module
/// documentation); the other kinds are watched by name.
pub fn read_by_get(kind: ObjectKind) -> bool {
    matches!(
        kind,
        ObjectKind::PersistentVolumeClaim
            | ObjectKind::PersistentVolume
            | ObjectKind::VolumeAttachment
            | ObjectKind::ServiceAccount
    )
}

/// What one read found.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Found {
    /// The object, at this `resourceVersion`, and whether it is ready.
    Present(Option<String>, bool),
    /// No such object.
    Absent,
}

/// Whether `o` is as a pod needs it to be: a claim bound, an attachment
/// attached (until then it is read again within [`MISSING_MAX`], as the
/// kubelet polls an attachment while it waits for it).
fn ready(o: &KubeObject) -> bool {
    match o {
        KubeObject::PersistentVolumeClaim(c) => {
            c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
        }
        KubeObject::VolumeAttachment(a) => a.status.as_ref().is_some_and(|s| s.attached),
        _ => true,
    }
}

/// Reads the object `r` names with `api` until the task is aborted,
/// sending what changed to `tx`. A read that fails sends
/// [`ObjectUpdate::Unreadable`] once (the source then knows the object was
/// tried), then backs off.
pub async fn poll<K: Kind>(
    api: Api<K>,
    r: ObjectRef,
    tx: mpsc::Sender<(ObjectRef, ObjectUpdate)>,
    problems: Arc<ApiProblems>,
) {
    let what = r.to_string();
    let mut last: Option<Found> = None;
    let mut failing = false;
    let mut period = SOON;
    let mut backoff = super::backoff::retries();
    loop {
        let delay = match api.get_opt(&r.name).await {
            Ok(obj) => {
                problems.works(&what);
                failing = false;
                backoff.reset();
                let obj = obj.map(|o| {
                    let version = o.metadata().resource_version.clone();
                    (K::wrap(Arc::new(o)), version)
                });
                let found = match &obj {
                    Some((o, version)) => Found::Present(version.clone(), ready(o)),
                    None => Found::Absent,
                };
                let obj = obj.map(|(o, _)| o);
                if last.as_ref() != Some(&found) {
                    let update = match obj {
                        Some(o) => ObjectUpdate::Present(o),
                        None => ObjectUpdate::Absent,
                    };
                    if tx.send((r.clone(), update)).await.is_err() {
                        return;
                    }
                    period = SOON;
                } else {
                    let max = match found {
                        Found::Absent | Found::Present(_, false) => MISSING_MAX,
                        Found::Present(_, true) => STABLE_MAX,
                    };
                    period = (period * 2).min(max);
                }
                last = Some(found);
                jittered(period)
            }
            Err(e) if r.kind == ObjectKind::ServiceAccount && refused(&e) => {
                // Only a token request's UID depends on it: without the
                // right to read it (the node authorizer of older clusters
                // refuses it), tokens are requested as the kubelet does.
                tracing::info!(object = %r, error = %e, "may not read the ServiceAccount; its tokens are requested without it");
                let _ = tx.send((r, ObjectUpdate::Absent)).await;
                return;
            }
            Err(e) => {
                tracing::debug!(object = %r, error = %e, "get failed; retrying");
                problems.request_failed(&what, &e);
                if !failing {
                    failing = true;
                    if tx
                        .send((r.clone(), ObjectUpdate::Unreadable(cause(&e))))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                backoff.next_delay()
            }
        };
        tokio::time::sleep(delay).await;
    }
}

/// `period` stretched by up to half of itself at random, as the kubelet
/// jitters its pod workers' resyncs (`workerResyncIntervalJitterFactor`):
/// the objects of pods that came together (a restart, a deployment's
/// roll-out) are not read again all in the same instant.
fn jittered(period: Duration) -> Duration {
    period + period.mul_f64(0.5 * random_fraction())
}

/// Whether the server refused the request for the credentials' rights.
fn refused(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.is_forbidden())
}
