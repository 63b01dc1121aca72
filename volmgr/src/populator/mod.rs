//! The kubelet's `desired_state_of_world_populator`: sources of pods (the
//! [`manifests`] directory; the C ABI feeds pods too) hand converted pods to
//! the [`Populator`], which resolves each volume to its plugin and unique
//! name and writes the desired state of world. [`pod`] turns a `v1.Pod` into
//! the volumes it needs, including PVC → PV → CSI through an
//! [`objects::ObjectStore`]; [`objects`] keeps the objects a source knows.
//!
//! Sources only see the narrow [`PodSink`] trait: they never reach the
//! reconciler, the executor or the manager.

pub mod convert;
mod desired_state_of_world_populator;
pub mod manifests;
pub mod objects;
pub mod resolver;
mod shared_sink;

pub use convert::sub_paths::{sub_path_release, sub_path_status, SubPathTiming};
pub use desired_state_of_world_populator::{Populator, SourceProblems};
pub use resolver::PodResolver;
pub use shared_sink::share_sink;

use crate::cache::world::WakeHold;
use crate::volume::PodUid;
use convert::pod::{DesiredPod, PodRejected};

/// Where a source of pods writes: the populator, through this narrow door.
pub trait PodSink: Send + Sync {
    /// Adds or updates a converted pod.
    fn set_pod(&self, pod: DesiredPod);
    /// Removes a pod; whether it was known.
    fn delete_pod(&self, uid: &PodUid) -> bool;
    /// Replaces what `source` (e.g. one manifest file) reported as unusable:
    /// inputs that yielded no pod, and pods rejected as a whole.
    fn set_source_problems(&self, source: &str, errors: Vec<String>, rejected: Vec<PodRejected>);
    /// Every pod of the source has been delivered once: volumes of pods no
    /// source knows may now be torn down.
    fn set_populated(&self);
    /// Marks pod `uid` as known to its source but not converted yet (`held`
    /// true: an object it reads could not be read), or no longer so. What
    /// is mounted for a held pod is kept: it exists, and its containers may
    /// be running (a restart found its volumes mounted).
    fn set_held(&self, uid: &PodUid, held: bool);
    /// Holds back the reconciler's wake-ups while a batch is applied; they
    /// are delivered when the returned hold is dropped.
    fn hold_wakes(&self) -> WakeHold;
}
