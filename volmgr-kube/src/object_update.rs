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
    /// The object could not be read (the cause is in status); it was tried.
    Unreadable,
    /// Every object of the kind, as (re)listed.
    Listed(Vec<KubeObject>),
    /// One object of the kind was deleted.
    Deleted(ObjectRef),
}
