//! What the watch of an object a pod reads reports to the API pod source
//! (`pods.rs`); the watches by name live there, the reads by `get` in
//! `object_get.rs`, the whole-kind watch of ClusterTrustBundles in
//! `trust_bundles.rs`.

use volmgr::populator::objects::{KubeObject, ObjectRef};

/// What an object's watch found (or, for a kind followed whole, the
/// kind's watch: `Listed`, then `Present` and `Deleted` per object).
#[derive(Debug)]
pub(super) enum ObjectUpdate {
    /// The object as it is now.
    Present(KubeObject),
    /// The object does not exist (deleted, or not created yet).
    Absent,
    /// The object could not be read (the cause is in status); it was
    /// tried. With the error as client-go prints it (`%v`): a refusal's
    /// message from the server (`persistentvolumeclaims "data" is
    /// forbidden: User ...`), else the client's error.
    Unreadable(String),
    /// Every object of the kind, as (re)listed.
    Listed(Vec<KubeObject>),
    /// One object of the kind was deleted.
    Deleted(ObjectRef),
}

/// A failed request's error as client-go prints it: the server's message
/// for a `Status` answer, the client's error otherwise.
pub(super) fn cause(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if !s.message.is_empty() => s.message.clone(),
        other => other.to_string(),
    }
}

/// [`cause`] of a failed list or watch.
pub(super) fn watch_cause(e: &kube::runtime::watcher::Error) -> String {
    use kube::runtime::watcher::Error as E;
    match e {
        E::InitialListFailed(k) | E::WatchStartFailed(k) | E::WatchFailed(k) => cause(k),
        E::WatchError(s) if !s.message.is_empty() => s.message.clone(),
        other => other.to_string(),
    }
}
